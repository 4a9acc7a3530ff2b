"""The commands of ``mqstore``, one module each (``node`` is mqstore.tools.node_cli); each
has ``add_arguments(parser)`` and ``run(args) -> exit code``, and mqstore.tools.cli lists them."""
