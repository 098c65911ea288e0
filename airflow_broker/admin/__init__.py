"""What an operator runs by hand: the doctor, the cleanup of leaked endpoints, and re-enabling
a queue that poison detection disabled."""
