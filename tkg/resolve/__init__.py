"""Entity resolution: every mention mapped to a canonical entity (people by parsed names,
companies by suffix-free names and the registry, offices by role and organisation); the
canonical_entities stage."""
