"""Build script: compiles the Cython kernels in ``ext/mqstore/<layer>/`` into ``mqstore.<layer>._*``
modules (the kernels grouped by the layer that uses them: ``log``, ``queue``, ``broker``,
``remoting``, ``client``, ``ha``, ``acl``, as uvloop groups its handles).

``ext/mqstore/`` and each layer folder are Cython packages (``__init__.pxd``): a kernel's cdef
classes are declared in its ``.pxd`` next to the ``.pyx`` and other kernels cimport them by their
module's name (``from mqstore.log._mapped cimport MappedFile``), as asyncpg's protocol.pxd does. The ``.pxd`` files
directly under ``ext/`` declare shared C (inline helpers and ``ext/include`` headers).

Switches (environment variables, as uvloop's build_ext has flags):
  MQSTORE_CYTHON_ANNOTATE=1   write Cython's HTML annotation next to each .pyx
  MQSTORE_DEBUG=1             build with -O0 -g and Cython's bounds checks on
  MQSTORE_CYTHON_TRACE=1      enable line tracing (for Cython.Coverage)
"""

from __future__ import annotations

import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext as _build_ext

CYTHON_MIN = (3, 0, 10)

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.join("ext", "mqstore")
# every ext/mqstore/<layer>/<name>.pyx becomes mqstore.<layer>.<name>
MODULES = sorted(f"{layer}.{p[:-4]}" for layer in os.listdir(os.path.join(HERE, KERNELS))
                 if os.path.isdir(os.path.join(HERE, KERNELS, layer))
                 for p in os.listdir(os.path.join(HERE, KERNELS, layer)) if p.endswith(".pyx"))
#: every .pxd a kernel may cimport (the shared C under ext/, each layer's declarations)
PXDS = sorted(os.path.join(d, p) for d, _, names in os.walk("ext") for p in names if p.endswith(".pxd"))


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0", "false", "no")


class build_ext(_build_ext):
    """Cythonize lazily so that Cython is only needed when actually building."""

    def finalize_options(self) -> None:
        import Cython
        from Cython.Build import cythonize

        version = tuple(int(p) for p in Cython.__version__.split(".")[:3] if p.isdigit())
        if version < CYTHON_MIN:
            raise RuntimeError(f"mqstore needs Cython >= {'.'.join(map(str, CYTHON_MIN))}, found {Cython.__version__}")
        directives = {
            "language_level": 3,
            "boundscheck": _flag("MQSTORE_DEBUG"),
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": _flag("MQSTORE_DEBUG"),
            "embedsignature": True,
        }
        if _flag("MQSTORE_CYTHON_TRACE"):
            directives.update(linetrace=True, binding=True)
        self.distribution.ext_modules = cythonize(
            self.distribution.ext_modules,
            compiler_directives=directives,
            include_path=["ext"],
            annotate=_flag("MQSTORE_CYTHON_ANNOTATE"),
            quiet=True,
            nthreads=os.cpu_count() or 1,  # Cython's C for the kernels, one process per core
        )
        super().finalize_options()
        if not self.parallel:  # the C compiles too, one per core (setuptools' --parallel)
            self.parallel = os.cpu_count() or 1


def _extension(name: str) -> Extension:
    debug = _flag("MQSTORE_DEBUG")
    macros = [("NPY_NO_DEPRECATED_API", "0"), ("_GNU_SOURCE", "1")]
    if _flag("MQSTORE_CYTHON_TRACE"):
        macros.append(("CYTHON_TRACE_NOGIL", "1"))
    return Extension(
        f"mqstore.{name}",
        [os.path.join(KERNELS, *name.split(".")) + ".pyx"],
        include_dirs=["ext/include"],
        # C zlib: the kernels that hand out bodies inflate the compressed ones (ext/mq_inflate.pxd)
        libraries=["z"],
        define_macros=macros,
        extra_compile_args=["-O0", "-g"] if debug else ["-O3", "-fno-strict-aliasing"],
        depends=[os.path.join("ext/include", h) for h in os.listdir("ext/include")] + PXDS,
    )


setup(
    ext_modules=[_extension(m) for m in MODULES],
    cmdclass={"build_ext": build_ext},
)
