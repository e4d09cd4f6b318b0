"""How long one turn on the device lasts: the fairness unit that the gateway and the inference
service share.

A request larger than a turn is cut by the gateway into chunks of about one turn of forward work
(gateway/coalesce.py), and the inference service's batcher merges queued rows into one forward
pass only up to about one turn (inference/batcher.py). So a small request arriving behind any
number of large ones waits about one turn, and rows whose client went away stop costing device
time within about one turn of the cancel: a forward that already runs cannot be interrupted, and
it is never longer than that.

50 ms keeps the per-call overhead (about 1 ms a gateway round trip) small beside a chunk while a
small request stays well under the 1 s a waiting client notices.
"""
TURN_MS = 50.0
