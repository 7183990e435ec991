"""An embedded local model: the weights (verified, assembled once) and, next, the server the Brain uses."""

# This start's key, which the local model's server and the Brain get through their environments.
KEY_VARIABLE = "PINCER_LOCAL_MODEL_KEY"
