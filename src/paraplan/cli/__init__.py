"""`paraplan <command>`: one small module per command, found by `main`."""
