"""Adapters to frameworks (each an optional extra): the core never imports them."""
