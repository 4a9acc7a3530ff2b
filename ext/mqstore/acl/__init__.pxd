# Marks ext/mqstore/acl as the package mqstore.acl for Cython: its kernels are cimported as
# ``from mqstore.acl._x cimport T`` (the declarations in ext/mqstore/acl/_x.pxd).
