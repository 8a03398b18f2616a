#!/usr/bin/env bash
# Installs the Debian packages whose PDF manuals `docqa-tools eval-pdfs` asks questions about
# (tools/pdf_questions.py SOURCES; each package's licence is in /usr/share/doc/<package>/copyright).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  valgrind debian-faq zlib1g-dev shared-mime-info nettle-dev bash-doc bzip2-doc libtasn1-doc
