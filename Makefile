# notifyq: systemd install, unit verification, test and demo entry points.
# DESTDIR stages an install (packaging); without it the live system is changed.

DESTDIR ?=
UNITDIR ?= /etc/systemd/system
CONFDIR ?= /etc/notifyq
# The command the units run; `pip install .` as root puts it in /usr/local/bin. For a venv:
#   make install-systemd NOTIFYQ=/opt/notifyq/bin/notifyq
NOTIFYQ ?= /usr/local/bin/notifyq
UNITS := $(wildcard systemd/*.service systemd/*.socket systemd/*.target)

.PHONY: install-systemd uninstall-systemd verify-systemd test demo

install-systemd:
	@case "$(NOTIFYQ)" in /*) ;; *) echo "install-systemd: NOTIFYQ must be an absolute path" >&2; exit 1;; esac
	install -d -m 0755 $(DESTDIR)$(UNITDIR) $(DESTDIR)$(CONFDIR) $(DESTDIR)$(CONFDIR)/conf.d
	install -m 0644 $(UNITS) $(DESTDIR)$(UNITDIR)/
	@if [ "$(NOTIFYQ)" != /usr/local/bin/notifyq ]; then \
		sed -i 's#^ExecStart=/usr/local/bin/notifyq #ExecStart=$(NOTIFYQ) #' \
			$(addprefix $(DESTDIR)$(UNITDIR)/,$(notdir $(UNITS))); \
	fi
	@[ -x "$(NOTIFYQ)" ] || echo "note: $(NOTIFYQ) does not exist yet: pip install . (or pass NOTIFYQ=/path/to/notifyq)"
	@# The config is the operator's once installed: never overwrite it.
	@if [ -e $(DESTDIR)$(CONFDIR)/notifyq.toml ]; then \
		echo "keeping existing $(DESTDIR)$(CONFDIR)/notifyq.toml"; \
	else \
		install -m 0644 etc/notifyq/notifyq.toml $(DESTDIR)$(CONFDIR)/notifyq.toml; \
	fi
	@[ -e $(DESTDIR)$(CONFDIR)/db_password ] || \
		echo "note: the units load $(CONFDIR)/db_password (LoadCredential=); create it (0600) before starting them"
	@# Reload only a live systemd, and never for a staged (DESTDIR) install.
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi

uninstall-systemd:
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then \
		systemctl disable --now notifyq.target 'notifyq-consumer@*.service' \
			'notifyq-producer@*.service' 'notifyq-producer@*.socket' || true; \
	fi
	rm -f $(addprefix $(DESTDIR)$(UNITDIR)/,$(notdir $(UNITS)))
	@# Instance links made by `systemctl enable` would dangle without their templates.
	rm -rf $(DESTDIR)$(UNITDIR)/notifyq.target.wants
	rm -f $(DESTDIR)$(UNITDIR)/sockets.target.wants/notifyq-producer@*.socket
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
	@echo "left $(DESTDIR)$(CONFDIR) in place (configuration and secrets)"

# systemd-analyze verify needs no running systemd, but fails when an Exec*= binary is
# missing, so the units are checked from a temporary copy whose notifyq ExecStart= points
# at /bin/true. Sibling units (the target, the socket's service) resolve because verify
# searches the directories of the files it is given. Unknown keys and unparsable values
# are only warnings (exit 0), so any output line naming a notifyq unit fails too.
verify-systemd:
	@command -v systemd-analyze >/dev/null || { echo "verify-systemd: systemd-analyze not installed" >&2; exit 1; }
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	for u in $(UNITS); do \
		sed 's#^ExecStart=/usr/local/bin/notifyq #ExecStart=/bin/true #' "$$u" > "$$tmp/$${u##*/}"; \
	done && \
	out=$$(systemd-analyze verify "$$tmp"/* 2>&1); rc=$$?; \
	[ -z "$$out" ] || printf '%s\n' "$$out" >&2; \
	if [ $$rc -ne 0 ] || printf '%s\n' "$$out" | grep -q notifyq; then \
		echo "verify-systemd: FAILED" >&2; exit 1; \
	fi; \
	echo "verify-systemd: $(notdir $(UNITS)) OK"

test:
	bash scripts/test.sh

demo:
	bash scripts/demo.sh
