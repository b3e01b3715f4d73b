"""The party daemon: one computing server (Alice, Bob, Carol or Dave) behind ppfs.v1.PartyService."""
