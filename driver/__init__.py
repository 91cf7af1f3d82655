"""The one driver: options, the stage table of every target, compile(), inputs."""
