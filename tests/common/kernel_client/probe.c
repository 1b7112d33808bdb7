/*
 * The guest side of the kernel NFS client: the tests' hands inside a Linux guest. It reads one
 * command per line from the control port (the guest's second serial line) and answers each
 * with one line, "<tag> ok ..." or "<tag> err <call> <errno name>", so that the host times every
 * step by when its answer arrives. Every call goes through the guest kernel's own NFS client.
 *
 *   mount <tag> <source> <dir> <options>   mount(2) of type nfs with the options as given
 *   hold <tag> <path> posix|flock           open (create) a file and lock it, kept open
 *   write <tag> <seq>                        write record <seq> at its offset, then fsync
 *   idle <tag>                               nothing on the file: does the lock stand? (no I/O)
 *   create <tag> <path>                      open a new file O_CREAT|O_EXCL, write, close
 *   held <tag>                               does another process find the lock taken? (LOCKT)
 *   verify <tag> <count>                     read records 0..count-1 back from the server
 *
 * A held file is owned by a child process of its own (a lock belongs to a process), which
 * serves that tag's commands, so a call blocked on a hard mount holds up only its own tag.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#define RECORD 64
#define MAX_HOLDERS 8

static int port;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	char line[512];
	va_list args;
	va_start(args, fmt);
	int n = vsnprintf(line, sizeof line - 1, fmt, args);
	va_end(args);
	if (n < 0 || n > (int)sizeof line - 2)
		n = sizeof line - 2;
	line[n++] = '\n';
	/* One write per line: answers of several holders never interleave. */
	if (write(port, line, n) < 0)
		_exit(3);
}

static void failed(const char *tag, const char *call)
{
	say("%s err %s %s", tag, call, strerrorname_np(errno) ? strerrorname_np(errno) : "?");
}

struct holder {
	char tag[32];
	int commands; /* the write end of its command pipe */
	pid_t pid;
};
static struct holder holders[MAX_HOLDERS];

static int lock_file(int fd, int posix)
{
	if (!posix)
		return flock(fd, LOCK_EX);
	struct flock lock = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
	return fcntl(fd, F_SETLKW, &lock);
}

/* Whether a process other than the holder is refused the lock: asked of the server. */
static int taken_for_others(const char *path, int posix)
{
	pid_t child = fork();
	if (child == 0) {
		int fd = open(path, O_RDWR);
		if (fd < 0)
			_exit(2);
		if (posix) {
			struct flock probe = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
			if (fcntl(fd, F_GETLK, &probe) < 0)
				_exit(2);
			_exit(probe.l_type == F_UNLCK ? 1 : 0);
		}
		if (flock(fd, LOCK_EX | LOCK_NB) == 0)
			_exit(1);
		_exit(errno == EWOULDBLOCK ? 0 : 2);
	}
	int status = 0;
	waitpid(child, &status, 0);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 2;
}

static void serve_held(const char *tag, int fd, const char *path, int posix, FILE *commands)
{
	char line[256], verb[32], rest[128];
	while (fgets(line, sizeof line, commands)) {
		rest[0] = 0;
		if (sscanf(line, "%31s %127s", verb, rest) < 1)
			continue;
		if (!strcmp(verb, "write")) {
			long seq = atol(rest);
			char record[RECORD];
			memset(record, ' ', sizeof record);
			int n = snprintf(record, sizeof record, "%s record %ld", tag, seq);
			record[n] = ' ';
			record[RECORD - 1] = '\n';
			if (pwrite(fd, record, RECORD, seq * RECORD) != RECORD)
				failed(tag, "write");
			else if (fsync(fd) < 0)
				failed(tag, "fsync");
			else
				say("%s ok write %ld", tag, seq);
		} else if (!strcmp(verb, "idle")) {
			say("%s ok idle", tag);
		} else if (!strcmp(verb, "held")) {
			int taken = taken_for_others(path, posix);
			say("%s ok held %s", tag, taken == 0 ? "yes" : taken == 1 ? "no" : "unknown");
		} else if (!strcmp(verb, "verify")) {
			long count = atol(rest), bad = 0;
			char record[RECORD], want[RECORD];
			int check = open(path, O_RDONLY);
			if (check < 0) {
				failed(tag, "open");
				continue;
			}
			for (long seq = 0; seq < count; seq++) {
				int n = snprintf(want, sizeof want, "%s record %ld ", tag, seq);
				if (pread(check, record, RECORD, seq * RECORD) != RECORD || memcmp(record, want, n))
					bad++;
			}
			close(check);
			say("%s ok verify %ld missing %ld", tag, count, bad);
		}
	}
	_exit(0);
}

static void hold(const char *tag, const char *path, const char *kind)
{
	int posix = strcmp(kind, "flock") != 0, pipes[2];
	struct holder *slot = NULL;
	for (int i = 0; i < MAX_HOLDERS && !slot; i++)
		if (!holders[i].tag[0])
			slot = &holders[i];
	if (!slot || pipe(pipes) < 0) {
		say("%s err hold too-many", tag);
		return;
	}
	pid_t child = fork();
	if (child == 0) {
		close(pipes[1]);
		int fd = open(path, O_RDWR | O_CREAT, 0644);
		if (fd < 0) {
			failed(tag, "open");
			_exit(1);
		}
		if (lock_file(fd, posix) < 0) {
			failed(tag, posix ? "fcntl" : "flock");
			_exit(1);
		}
		say("%s ok hold %s", tag, kind);
		serve_held(tag, fd, path, posix, fdopen(pipes[0], "r"));
	}
	close(pipes[0]);
	snprintf(slot->tag, sizeof slot->tag, "%s", tag);
	slot->commands = pipes[1];
	slot->pid = child;
}

static void create_file(const char *tag, const char *path)
{
	pid_t child = fork();
	if (child != 0)
		return;
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
	if (fd < 0) {
		failed(tag, "open");
		_exit(1);
	}
	if (write(fd, "new\n", 4) != 4)
		failed(tag, "write");
	else if (close(fd) < 0)
		failed(tag, "close");
	else
		say("%s ok create", tag);
	_exit(0);
}

static void do_mount(const char *tag, const char *source, const char *dir, const char *options)
{
	pid_t child = fork();
	if (child != 0)
		return;
	mkdir(dir, 0755);
	if (mount(source, dir, "nfs", 0, options) < 0)
		failed(tag, "mount");
	else
		say("%s ok mount", tag);
	_exit(0);
}

static void pass_on(const char *tag, const char *line)
{
	for (int i = 0; i < MAX_HOLDERS; i++)
		if (!strcmp(holders[i].tag, tag)) {
			if (write(holders[i].commands, line, strlen(line)) < 0)
				failed(tag, "pass");
			return;
		}
	say("%s err unknown-tag", tag);
}

int main(int argc, char **argv)
{
	port = open(argc > 1 ? argv[1] : "/dev/ttyS1", O_RDWR | O_NOCTTY);
	if (port < 0)
		return 2;
	struct termios raw;
	if (tcgetattr(port, &raw) == 0) {
		cfmakeraw(&raw);
		tcsetattr(port, TCSANOW, &raw);
	}
	signal(SIGCHLD, SIG_IGN);
	FILE *commands = fdopen(dup(port), "r");
	say("probe ok ready");
	char line[512], verb[32], tag[32], a[256], b[256], c[256];
	while (fgets(line, sizeof line, commands)) {
		int n = sscanf(line, "%31s %31s %255s %255s %255s", verb, tag, a, b, c);
		if (n < 2)
			continue;
		if (!strcmp(verb, "mount") && n == 5)
			do_mount(tag, a, b, c);
		else if (!strcmp(verb, "hold") && n == 4)
			hold(tag, a, b);
		else if (!strcmp(verb, "create") && n == 3)
			create_file(tag, a);
		else if (!strcmp(verb, "write") || !strcmp(verb, "idle") || !strcmp(verb, "held") ||
			 !strcmp(verb, "verify")) {
			char passed[300];
			snprintf(passed, sizeof passed, "%s %s\n", verb, n > 2 ? a : "");
			pass_on(tag, passed);
		} else
			say("%s err usage %s", tag, verb);
	}
	return 0;
}
