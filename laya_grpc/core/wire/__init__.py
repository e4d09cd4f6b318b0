"""How the processes talk: gRPC plumbing and its error mapping, the one call multiplexer and its
unix-socket transport, and the forms token rows, questions and labels take on the internal
contract."""
