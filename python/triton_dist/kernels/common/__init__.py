"""Pieces every kernel family shares: the context base (symmetric buffers, signal pad, call counter,
preload), the signal layout, the LL protocol, the ring schedule, tiles, tickets, the rank barrier and
global scratch. Nothing here imports a family."""
