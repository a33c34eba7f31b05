"""MySQL and MariaDB: chunk reads (``dialect``, ``client``, ``types``), setup checks
(``setup``), the binlog (``decoder`` makes events, ``reader`` streams), and the binlog
position's health (``positions``)."""
