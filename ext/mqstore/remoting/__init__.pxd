# Marks ext/mqstore/remoting as the package mqstore.remoting for Cython: its kernels are cimported as
# ``from mqstore.remoting._x cimport T`` (the declarations in ext/mqstore/remoting/_x.pxd).
