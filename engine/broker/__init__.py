"""Broker work that runs beside the clients: store maintenance and the jobs' store-level logic; the
one order of the broker's passes (:mod:`.plan`) and its in-process runner (:mod:`.loop`)."""
