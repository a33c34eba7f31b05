"""PostgreSQL: chunk reads over ADBC (``dialect``, ``arrow``, ``types``), capture setup
(``setup``), the pgoutput log (``pgoutput`` parses, ``decoder`` makes events, ``reader``
streams), and the replication slot's health (``positions``)."""
