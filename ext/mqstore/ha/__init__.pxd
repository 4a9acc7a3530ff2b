# Marks ext/mqstore/ha as the package mqstore.ha for Cython: its kernels are cimported as
# ``from mqstore.ha._x cimport T`` (the declarations in ext/mqstore/ha/_x.pxd).
