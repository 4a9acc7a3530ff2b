# Marks ext/mqstore as the package mqstore for Cython: a kernel cimports another as
# ``from mqstore.log._mapped cimport MappedFile`` (the declarations in ext/mqstore/log/_mapped.pxd; each
# layer's folder is a package too).
