# Marks ext/mqstore/broker as the package mqstore.broker for Cython: its kernels are cimported as
# ``from mqstore.broker._x cimport T`` (the declarations in ext/mqstore/broker/_x.pxd).
