# Marks ext/mqstore/queue as the package mqstore.queue for Cython: its kernels are cimported as
# ``from mqstore.queue._x cimport T`` (the declarations in ext/mqstore/queue/_x.pxd).
