"""The broker front: RocketMQ's remoting protocol over TCP (docs/rocketmq-remoting-spec.md).

In progress. What exists: the request and response codes and how a put's status answers a send
(``codes``), the NameServer's route table and its JSON (``routes``) and the NameServer itself
(``namesrv``, ``mqstore namesrv``), a broker's topics and ``config/topics.json`` (``topics``); the
frame codec is the compiled ``mqstore._remoting``.
"""
