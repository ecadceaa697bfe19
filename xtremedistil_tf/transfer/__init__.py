"""The transfer set's teacher outputs: computed once (outputs, multigrained, classification) into the sharded cache and read back by the students."""
