"""The engine: the answer loop (`decider.Decider`) and the `Services` it runs on, remote
(`remote_services.RemoteServices`, the backend processes) or in-process (`inprocess.InProcessServices`)."""
