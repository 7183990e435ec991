"""Session transcripts and long-term memory, stored in Redis."""
