"""Access control: RocketMQ 4.9.7's plain ACL (docs/security.md).

- ``mqstore.acl.plain``: conf/plain_acl.yml (accounts, permissions, global white list), loaded
  with errors naming the file and the entry;
- ``mqstore.acl.address``: the remote address patterns (``*``, ``10.1.2.*``, ``10.1.2.{1,2}``,
  ``10.1.2.1-5``, IPv6);
- ``mqstore.acl.signature``: the request signature (HMAC-SHA1, Base64) of the Java and C++
  clients, and the SessionCredentials a client signs with; ``mqstore.acl._acl`` is its compiled twin;
- ``mqstore.acl.validator``: what each request code needs, and ``check()``;
- ``mqstore.acl.holder``: ``AclHolder``, the ACL in force, reloaded when its file changes.

    holder = AclHolder(config.acl_path(root))
    remark = check(holder.current(), code, ext_fields, body, remote_ip)  # None: allowed
"""

from mqstore.acl.address import RemoteAddress, normalize_ip, remote_address
from mqstore.acl.holder import AclHolder
from mqstore.acl.plain import (ANY, DENY, PUB, SUB, Account, AclConfigError, PlainAcl, check_permission, load_acl,
                               parse_acl, parse_perm)
from mqstore.acl.signature import (SessionCredentials, as_credentials, calc_signature, request_content, sign_fields,
                                   signature_matches)
from mqstore.acl.validator import (ADMIN_CODES_4_9_7, CLIENT_CODES, check, needs_admin, offset_group, offset_refusal,
                                   resources)

__all__ = ["ADMIN_CODES_4_9_7", "ANY", "Account", "AclConfigError", "AclHolder", "CLIENT_CODES", "DENY", "PUB",
           "PlainAcl", "RemoteAddress", "SUB", "SessionCredentials", "as_credentials", "calc_signature", "check",
           "check_permission", "load_acl", "needs_admin", "normalize_ip", "offset_group", "offset_refusal", "parse_acl",
           "parse_perm", "remote_address", "request_content", "resources", "sign_fields", "signature_matches"]
