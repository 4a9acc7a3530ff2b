"""Access control: RocketMQ's plain ACL (plain_acl.yml accounts, the request signature, the
permission each request code needs). docs/security.md."""
