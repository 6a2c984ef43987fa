"""Each framework integration tested with the real framework: FastAPI, Flask, Django."""
