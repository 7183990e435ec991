"""An embedded local model: the weights (verified, assembled once) and, next, the server the Brain uses."""
