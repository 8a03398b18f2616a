#!/usr/bin/env bash
# Installs the Debian documentation packages that training/corpus.py reads (real English technical
# prose, all under free licences: see each package's /usr/share/doc/<package>/copyright).
# The held-out evaluation reads other sources (licence files, libgcrypt's and ReportLab's manuals),
# so those are not listed here.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  debian-reference-en debian-faq debian-handbook developers-reference \
  python3.11-doc bash-doc sqlite3-doc git-doc
