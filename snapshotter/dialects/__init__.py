"""Database dialects: catalog, chunk SQL, watermarks and capture setup, one module each."""
