"""The embedded demo, loaded only on the embedded path: Countdown, its multi-turn environment and
the tiny model built offline."""
