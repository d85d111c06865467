"""What every other package uses: errors with a message a person can act on, byte units, the base of
the immutable records, and opening only regular files of a sensible size."""
