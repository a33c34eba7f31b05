"""Log readers: the database's change log as positioned events (parsing apart from IO)."""
