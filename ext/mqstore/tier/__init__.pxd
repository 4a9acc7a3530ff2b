# Marks ext/mqstore/tier as the package mqstore.tier for Cython: its kernels are cimported as
# ``from mqstore.tier._x cimport T`` (the declarations in ext/mqstore/tier/_x.pxd).
