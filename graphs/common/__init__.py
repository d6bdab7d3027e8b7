"""Building blocks shared by several model graphs."""
