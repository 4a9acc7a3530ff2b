"""The broker: RocketMQ's remoting protocol over TCP on an mqstore node (docs/broker.md,
docs/rocketmq-remoting-spec.md).

``server`` composes it (``Broker``: the store's node, the front processes, the controller, an
embedded NameServer); ``front`` is a front process (client connections: sends, pulls with long
polling, the store's reads); ``controller`` holds what is broker-wide (``topics``, ``groups``,
``offsets``, ``clients``, order locks, ``schedule`` for delayed delivery, ``retry`` for send-back)
and registers with the NameServers (``namesrv`` over ``routes``); ``link`` joins fronts and
controller; ``consumer`` is the embedded consumer group; ``codes`` maps put statuses to answers;
``jsonfile`` writes the config files. The frame codec is the compiled ``mqstore.remoting._remoting``, the
codes ``mqstore.protocol``.
"""
