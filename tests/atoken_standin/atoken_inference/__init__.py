"""A small stand-in for the official InternLumina-U2 `atoken_inference` package, for lumina's tests only.

It exposes the five calls lumina's AToken adapter makes, with the official tensor conventions (the file each
convention is taken from is named at the call), and codes each 16 x 16 px patch by its mean colour:
codebooks 0-2 hold the three channel means quantised to 4096 levels over [-1, 1], codebooks 3-7 are zero.
Decoding paints each patch its mean colour, so a flat-coloured image round-trips (to 1/4095 precision). It is
a stand-in for the glue, not for AToken's quality.
"""
