"""The local defences as pure cores: admission, server and client shedding, peer limits."""
