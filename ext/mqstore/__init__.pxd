# Marks ext/mqstore as the package mqstore for Cython: a kernel cimports another as
# ``from mqstore._mapped cimport MappedFile`` (the declarations in ext/mqstore/<module>.pxd).
