"""Relay's training process: the shared loop in one rank (``python -m tests.platforms.relay.worker``)."""

from pipelines.training.worker import main

if __name__ == "__main__":
    main()
