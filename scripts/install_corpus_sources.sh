#!/usr/bin/env bash
# Installs the Debian documentation packages that training/corpus.py reads (real English technical
# prose, all under free licences: see each package's /usr/share/doc/<package>/copyright).
# nettle-dev, bzip2-doc and libtasn1-doc bring info manuals whose PDFs are `docqa-tools eval-pdfs`'
# seen sources. The held-out evaluations read other sources (licence files; the PDFs of valgrind,
# zlib1g-dev and shared-mime-info, which training/corpus.py leaves out), so those are not listed here.
# wordnet-base is WordNet 3.0's database, which training/synonyms.py reads for reworded questions.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  debian-reference-en debian-faq debian-handbook developers-reference \
  python3.11-doc bash-doc sqlite3-doc git-doc nettle-dev bzip2-doc libtasn1-doc wordnet-base
