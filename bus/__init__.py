"""The shared wire of Pincer: messages, streams, keys, config, logging, embedded Redis."""
