"""Cloud Spanner: change streams (work in progress, issue 20)."""
