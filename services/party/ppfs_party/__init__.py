"""The party daemon: one computing server (Alice, Bob, Carol, Dave) behind PartyService."""
