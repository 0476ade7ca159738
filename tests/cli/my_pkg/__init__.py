"""The README's agent program as a package (the documented-command test imports ``my_pkg.agent``; pytest puts
``tests/cli`` on ``sys.path``)."""
