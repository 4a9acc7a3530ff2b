# Marks ext/mqstore/log as the package mqstore.log for Cython: its kernels are cimported as
# ``from mqstore.log._x cimport T`` (the declarations in ext/mqstore/log/_x.pxd).
