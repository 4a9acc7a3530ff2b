# Marks ext/mqstore/client as the package mqstore.client for Cython: its kernels are cimported as
# ``from mqstore.client._x cimport T`` (the declarations in ext/mqstore/client/_x.pxd).
