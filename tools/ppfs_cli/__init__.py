"""The ``ppfs`` command and the local development stack: the one package that may use
every other (the core ppfs, the party and gateway daemons, the client)."""
