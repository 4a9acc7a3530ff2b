"""RocketMQ's remoting frames (docs/rocketmq-remoting-spec.md §1): the compiled codec
``mqstore.remoting._remoting`` (headers in both serializations, frames, the request codes'
fixed headers), shared by the broker, the client, the Spark network source and the tools. The
codes themselves are named in ``mqstore.protocol``."""
