"""The engine: the answer loop (`decider.Decider`) and the `Services` it runs on, remote
(`remote.RemoteServices`, the backend processes) or in-process (`inprocess.InProcessServices`)."""
