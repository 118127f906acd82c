<?php

declare(strict_types=1);

namespace Raftlock;

/**
 * A raftlock cluster over its HTTP/JSON API (php-curl, HTTP/1.1).
 *
 * Requests go to the leader: a node that is not the leader answers 503
 * naming it, and the request is sent there at once; a node that cannot be
 * reached, or knows no leader, passes the request to the next node, with
 * a pause (jittered, 20 ms doubling to 200 ms) once every node has failed in a row.
 * A request gives up after the retry timeout without an answer. Every
 * request this class sends is safe to repeat: a Lock and an OpenSession
 * carry a nonce (a retry finds the session the first attempt opened),
 * SetSessionTtl, AcquireAll, Upgrade and Downgrade a seq, and Unlock,
 * Cancel and KeepAlive are idempotent.
 *
 * The sessions it opens end with the process (end_on_disconnect_ms,
 * default 750 ms): the process keeps one streaming KeepAlive per cluster
 * open (SessionStream), and every call into any Client of the process
 * renews its sessions on it when due; state() and isHeld() tell held,
 * jeopardy and lost apart.
 */
final class Client
{
    /** Shortest session ttl a node accepts, in milliseconds. */
    public const MIN_TTL_MS = 1000;
    /** Longest session ttl a node accepts, in milliseconds. */
    public const MAX_TTL_MS = 3600000;
    /** Longest lock name, in bytes of UTF-8. */
    public const MAX_NAME_BYTES = 512;
    /** Largest semaphore capacity a node accepts. */
    public const MAX_CAPACITY = 1000000;
    /** First pause after every node failed in a row, in seconds; it doubles up to MAX_BACKOFF. */
    public const INITIAL_BACKOFF = 0.02;
    /** Longest pause between rounds of attempts, in seconds. */
    public const MAX_BACKOFF = 0.2;
    /** Attempts in a row at every endpoint, each refused or unresolved, after which a request gives up at once. */
    public const REFUSED_ROUNDS = 3;
    /** Default for the `retry_timeout` option, in seconds. */
    public const DEFAULT_RETRY_TIMEOUT = 15.0;
    /** One attempt of a request that does not wait in a queue, in seconds. */
    public const ATTEMPT_TIMEOUT = 5.0;
    /** Most names in one lockAll (the node's limit per AcquireAll). */
    public const MAX_NAMES_PER_LOCK_ALL = 64;
    /** Default for the `end_on_disconnect_ms` option: a session ends this long after its process's stream closes. */
    public const DEFAULT_END_ON_DISCONNECT_MS = 750;
    /** Longest `end_on_disconnect_ms` a node accepts. */
    public const MAX_END_ON_DISCONNECT_MS = 60000;

    public const EXCLUSIVE = 'MODE_EXCLUSIVE';
    public const SHARED = 'MODE_SHARED';
    public const SEMAPHORE = 'MODE_SEMAPHORE';

    /** @var list<string> base URLs, "http://host:port" */
    private array $endpoints;
    private ?string $token;
    private float $retryTimeout;
    private float $connectTimeout;
    /** @var array<int, mixed> */
    private array $curlOptions;
    private ?string $leader = null;
    private int $next = 0;
    private int $askId = 0;
    /** @var \CurlHandle|null */
    private $curl = null;
    private int $grace;
    private SessionStream $stream;
    /** When the last request attempt was sent (monotonic seconds). */
    private float $sent = 0.0;

    /**
     * @param string      $endpoints comma-separated node addresses: "host:port",
     *                               "http://host:port" or "https://host:port"
     * @param string|null $token     sent as "Authorization: Bearer TOKEN"
     * @param array{retry_timeout?: float, connect_timeout?: float, curl?: array<int, mixed>, end_on_disconnect_ms?: int} $options
     *        retry_timeout: seconds a request keeps retrying without an answer (default 15, as in every raftlock client);
     *        connect_timeout: seconds to connect to one node (default 2);
     *        curl: extra CURLOPT_* settings, e.g. CURLOPT_CAINFO for https;
     *        end_on_disconnect_ms: the grace after which the sessions this client opens end once this
     *        process's KeepAlive stream closes (default 750; 0: off, they end by their ttl alone)
     */
    public function __construct(string $endpoints, ?string $token = null, array $options = [])
    {
        if (!\extension_loaded('curl')) {
            throw new \LogicException('raftlock: the curl extension is needed (Debian: apt-get install php-curl)');
        }
        $this->endpoints = [];
        foreach (explode(',', $endpoints) as $e) {
            $e = trim($e);
            if ('' !== $e) {
                $this->endpoints[] = self::endpointUrl($e);
            }
        }
        if (!$this->endpoints) {
            throw new \InvalidArgumentException("raftlock: no endpoints in \"$endpoints\"");
        }
        $unknown = array_diff(array_keys($options), ['retry_timeout', 'connect_timeout', 'curl', 'end_on_disconnect_ms']);
        if ($unknown) {
            throw new \InvalidArgumentException('raftlock: unknown options: '.implode(', ', $unknown));
        }
        $this->token = $token;
        $this->retryTimeout = (float) ($options['retry_timeout'] ?? self::DEFAULT_RETRY_TIMEOUT);
        $this->connectTimeout = (float) ($options['connect_timeout'] ?? 2.0);
        if ($this->retryTimeout <= 0 || $this->connectTimeout <= 0) {
            throw new \InvalidArgumentException('raftlock: retry_timeout and connect_timeout must be positive');
        }
        $this->curlOptions = $options['curl'] ?? [];
        $grace = $options['end_on_disconnect_ms'] ?? self::DEFAULT_END_ON_DISCONNECT_MS;
        if (!\is_int($grace) || $grace < 0 || $grace > self::MAX_END_ON_DISCONNECT_MS) {
            throw new \InvalidArgumentException('raftlock: end_on_disconnect_ms must be an int of 0..='.self::MAX_END_ON_DISCONNECT_MS.' (0: off)');
        }
        $this->grace = $grace;
        $this->stream = SessionStream::of($this->endpoints, $this->token, $this->curlOptions, $this->connectTimeout);
    }

    /** The grace (ms) the sessions this client opens ask for: `end_on_disconnect_ms` (0: off). */
    public function endOnDisconnectMs(): int
    {
        return $this->grace;
    }

    private static function endpointUrl(string $e): string
    {
        $raw = str_contains($e, '://') ? $e : 'http://'.$e;
        $u = parse_url($raw);
        if (false === $u || !\in_array($u['scheme'] ?? '', ['http', 'https'], true) || !isset($u['host'], $u['port'])
            || isset($u['user']) || isset($u['query']) || (isset($u['path']) && '/' !== $u['path'])) {
            throw new \InvalidArgumentException("raftlock: endpoint \"$e\": want host:port or http(s)://host:port");
        }
        $host = str_contains($u['host'], ':') && '[' !== $u['host'][0] ? '['.$u['host'].']' : $u['host'];

        return $u['scheme'].'://'.$host.':'.$u['port'];
    }

    /**
     * Opens a session and acquires $name in it, in one write (the node's
     * one-call Lock).
     *
     * @param int|null $timeoutMs 0: try once; null: wait without a timeout;
     *                            otherwise wait at most this long. While it
     *                            waits the node keeps the session alive; if
     *                            this process dies, its connection closes and
     *                            the node withdraws the wait. A wait the node
     *                            ends early (its session closed under it) is
     *                            sent again, in a new session.
     *
     * A grant is returned held (state() "held"): with a grace, it is
     * renewed on the stream at once, again until an answer leaves it held;
     * without one, renewed once if the grant waited. A grant whose session
     * turns out to have ended is unlocked and waited for again, as a wait
     * withdrawn; one that no renewal answer reaches within the retry
     * timeout is unlocked and this throws UNAVAILABLE.
     *
     * @return array{acquired: bool, fence: int, session_id: int, ttl_ms: int, next_seq: int}
     *         fence and session_id are 0 when not acquired (no session is left)
     */
    public function lock(string $name, int $ttlMs, ?int $timeoutMs = 0, string $mode = self::EXCLUSIVE, int $weight = 0, int $capacity = 0): array
    {
        self::checkName($name);
        self::checkTtl($ttlMs);
        if (null !== $timeoutMs && $timeoutMs < 0) {
            throw new \InvalidArgumentException("raftlock: timeout $timeoutMs ms is negative (null waits without a timeout)");
        }
        $body = ['name' => $name, 'ttl_ms' => (string) $ttlMs];
        if ($this->grace > 0) {
            $body['end_on_disconnect_ms'] = $this->grace;
        }
        if (null === $timeoutMs) {
            $body['wait'] = true;
        }
        if (self::EXCLUSIVE !== $mode) {
            $body['mode'] = $mode;
        }
        if (self::SEMAPHORE === $mode) {
            $body['weight'] = $weight;
            $body['capacity'] = $capacity;
        }
        $deadline = null === $timeoutMs ? null : microtime(true) + $timeoutMs / 1000;
        $withdrawn = 0;
        while (true) {
            if (null !== $deadline) {
                $body['timeout_ms'] = (string) (0 === $timeoutMs ? 0 : max(1, (int) ceil(($deadline - microtime(true)) * 1000)));
            }
            // A new attempt, a new nonce; its retries (inside call) keep it.
            $body['nonce'] = (string) random_int(1, \PHP_INT_MAX);
            // A request that waits has no attempt timeout.
            $r = $this->call('locks/Lock', $body, 0 === $timeoutMs ? self::ATTEMPT_TIMEOUT : 0.0);
            if ($r['acquired'] ?? false) {
                $session = (int) ($r['session_id'] ?? 0);
                $this->stream->add($session, (int) ($r['ttl_ms'] ?? 0) ?: $ttlMs, $this->grace, $this->sent, $this->leader);
                if (!$this->confirm($session, $this->sent)) {
                    // Granted, but its session ended before a renewal
                    // could be answered (released now, in case): as a
                    // wait withdrawn under it.
                    $r = ['acquired' => false];
                }
            }
            if (($r['acquired'] ?? false) || 0 === $timeoutMs || (null !== $deadline && microtime(true) >= $deadline)) {
                break;
            }
            // "Not acquired" before the timeout: the wait was withdrawn under
            // it (the node ended its session, as it does when an earlier
            // attempt's connection closed). Wait again, in a new session,
            // after a pause that grows to 1 s (never a busy loop).
            $withdrawn = min(20, $withdrawn + 1);
            usleep($withdrawn * 50000);
        }

        return [
            'acquired' => (bool) ($r['acquired'] ?? false),
            'fence' => (int) ($r['fence'] ?? 0),
            'session_id' => (int) ($r['session_id'] ?? 0),
            'ttl_ms' => (int) ($r['ttl_ms'] ?? 0),
            'next_seq' => (int) ($r['next_seq'] ?? 0),
        ];
    }

    /**
     * Makes a grant just answered in $session (counted, its request sent at
     * $sent) held before it is handed to the application. With a grace:
     * renewed on the stream at once (the granting call carried the session
     * until its answer, so the stream takes it over within the grace),
     * again until an answer leaves it held. Without one: its lease is the
     * ttl from $sent, renewed once at once if the grant waited (its answer
     * came later than a tenth of the ttl after $sent). True: held. False:
     * the session turned out to have ended; it is unlocked (quietly) and
     * no longer counted. Throws (after unlocking it quietly) when no
     * renewal was answered in time (UNAVAILABLE) or a renewal failed.
     */
    private function confirm(int $session, float $sent): bool
    {
        try {
            if ($this->grace > 0) {
                $held = $this->isHeld($session);
            } else {
                $waited = SessionStream::now() - $sent > $this->stream->ttl($session) / 10000;
                $held = (!$waited && 'held' === $this->stream->state($session)) || ($this->keepAlive($session) && 'held' === $this->stream->state($session));
            }
            if ($held) {
                return true;
            }
            $lost = 'lost' === $this->stream->state($session);
        } catch (\Throwable $e) {
            $this->unlockQuietly($session);
            throw $e;
        }
        $this->unlockQuietly($session);
        if ($lost) {
            return false;
        }
        throw new RaftlockException('UNAVAILABLE', "granted, but no renewal of session $session was answered within the retry timeout (released)");
    }

    /**
     * Opens a session and takes every name of $locks in it in one atomic
     * request (AcquireAll, one write): all of them, each with its own fence
     * (consecutive, in the order given), or none. If they cannot all be
     * granted now, the request takes its place at the end of every name's
     * queue at once and waits, up to $timeoutMs, until it is first in line
     * for all of them (holding up whoever queues behind it on each name,
     * even a free one). Two such requests never wait for each other,
     * whatever order they name things in. While PHP waits, the stream
     * renews the session only for a ttl after it opened (and not at all
     * without a grace), so a wait must be shorter than the ttl (and cannot
     * be unbounded). A grant is returned held, as lock()'s. A request not
     * granted, or one that fails, or a grant whose session turns out to
     * have ended, has its session closed before this returns (withdrawing
     * it from every queue, or releasing what it may have been granted).
     * Release with unlock($r['session_id']).
     *
     * @param array<string, string> $locks     name => self::EXCLUSIVE or self::SHARED, 1..=MAX_NAMES_PER_LOCK_ALL names
     * @param int                   $timeoutMs 0: try once; otherwise wait at most this long (< $ttlMs)
     *
     * @return array{acquired: bool, session_id: int, ttl_ms: int, next_seq: int, grants: list<array{name: string, fence: int, mode: string}>}
     *         session_id is 0 and grants empty when not acquired (no session is left)
     */
    public function lockAll(array $locks, int $ttlMs, int $timeoutMs = 0): array
    {
        $n = \count($locks);
        if ($n < 1 || $n > self::MAX_NAMES_PER_LOCK_ALL) {
            throw new \InvalidArgumentException("raftlock: lockAll of $n names: must be 1..=".self::MAX_NAMES_PER_LOCK_ALL);
        }
        $specs = [];
        foreach ($locks as $name => $mode) {
            $name = (string) $name;
            self::checkName($name);
            if (self::EXCLUSIVE !== $mode && self::SHARED !== $mode) {
                throw new \InvalidArgumentException("raftlock: lockAll mode of \"$name\": want Client::EXCLUSIVE or Client::SHARED");
            }
            $specs[] = self::EXCLUSIVE === $mode ? ['name' => $name] : ['name' => $name, 'mode' => $mode];
        }
        self::checkTtl($ttlMs);
        if ($timeoutMs < 0 || $timeoutMs >= $ttlMs) {
            throw new \InvalidArgumentException("raftlock: lockAll timeout $timeoutMs ms: must be 0..$ttlMs ms (under the ttl: the session is renewed for at most a ttl while PHP waits)");
        }
        $openBody = ['ttl_ms' => (string) $ttlMs, 'nonce' => (string) random_int(1, \PHP_INT_MAX)];
        if ($this->grace > 0) {
            $openBody['end_on_disconnect_ms'] = $this->grace;
        }
        $open = $this->call('locks/OpenSession', $openBody);
        $openSent = $this->sent;
        $session = (int) ($open['session_id'] ?? 0);
        // Counted, and carried by the stream from its next pump on (while
        // the AcquireAll waits, too).
        $this->stream->add($session, (int) ($open['ttl_ms'] ?? 0) ?: $ttlMs, $this->grace, $this->sent, $this->leader);
        try {
            $r = $this->call('locks/AcquireAll', [
                'session_id' => (string) $session,
                'seq' => '1',
                'locks' => $specs,
                'timeout_ms' => (string) $timeoutMs,
            ], 0 === $timeoutMs ? self::ATTEMPT_TIMEOUT : 0.0);
        } catch (\Throwable $e) {
            $this->unlockQuietly($session);
            throw $e;
        }
        $grants = [];
        foreach ($r['grants'] ?? [] as $g) {
            $grants[] = ['name' => (string) ($g['name'] ?? ''), 'fence' => (int) ($g['fence'] ?? 0), 'mode' => (string) ($g['mode'] ?? self::EXCLUSIVE)];
        }
        if (!($r['acquired'] ?? false) || \count($grants) !== $n) {
            $this->unlockQuietly($session);
            if ($r['acquired'] ?? false) {
                throw new RaftlockException('INTERNAL', "lockAll of $n names was granted ".\count($grants));
            }

            return ['acquired' => false, 'session_id' => 0, 'ttl_ms' => 0, 'next_seq' => 0, 'grants' => []];
        }
        $this->stream->granted($session);
        if (!$this->confirm($session, $openSent)) {
            // Its session ended before a renewal was answered (unlocked).
            return ['acquired' => false, 'session_id' => 0, 'ttl_ms' => 0, 'next_seq' => 0, 'grants' => []];
        }

        return ['acquired' => true, 'session_id' => $session, 'ttl_ms' => (int) ($open['ttl_ms'] ?? $ttlMs), 'next_seq' => 2, 'grants' => $grants];
    }

    /**
     * Upgrades the shared grant $fence on $name that $sessionId holds to
     * exclusive, with no window for another writer (the Upgrade RPC; $seq
     * is the session's next sequence number, e.g. lock()'s next_seq).
     * Granted at once if it is the name's only reader; otherwise it waits
     * ahead of everyone queued, keeping the read, until the other readers
     * leave or $timeoutMs passes (0: try once): then acquired is false and
     * the read still held. While PHP waits, the stream renews the session
     * only for a ttl after its last use (and not at all without a grace):
     * keep $timeoutMs under its ttl. Another reader upgrading the same name at
     * the same time makes this throw a RaftlockException with status
     * ABORTED at once (the two would wait for each other forever), the
     * read still held. If the request fails in any other way than by the
     * node's refusal, it is withdrawn with Cancel before the exception is
     * thrown, which also releases the lock if the upgrade had been granted.
     *
     * @return array{acquired: bool, fence: int} fence: the exclusive grant's new, larger fence
     */
    public function upgrade(int $sessionId, int $seq, string $name, int $fence, int $timeoutMs = 0): array
    {
        self::checkName($name);
        if ($timeoutMs < 0) {
            throw new \InvalidArgumentException("raftlock: upgrade timeout $timeoutMs ms is negative");
        }
        $body = ['session_id' => (string) $sessionId, 'seq' => (string) $seq, 'name' => $name, 'fence' => (string) $fence, 'timeout_ms' => (string) $timeoutMs];
        try {
            $r = $this->call('locks/Upgrade', $body, 0 === $timeoutMs ? self::ATTEMPT_TIMEOUT : 0.0);
        } catch (RaftlockException $e) {
            if (\in_array($e->getStatus(), ['UNAVAILABLE', 'UNKNOWN', 'DEADLINE_EXCEEDED', 'CANCELLED', 'INTERNAL'], true)) {
                $this->cancelQuietly($sessionId, $seq, $name);
            }
            throw $e;
        } catch (\Throwable $e) {
            $this->cancelQuietly($sessionId, $seq, $name);
            throw $e;
        }

        return ['acquired' => (bool) ($r['acquired'] ?? false), 'fence' => (int) ($r['fence'] ?? 0)];
    }

    /**
     * Downgrades the exclusive grant $fence on $name that $sessionId holds
     * to shared, at once, keeping its fence (the Downgrade RPC); shared
     * requests queued behind it come in. FAILED_PRECONDITION if the session
     * does not hold $name exclusively with $fence.
     *
     * @return int the grant's fence, unchanged
     */
    public function downgrade(int $sessionId, int $seq, string $name, int $fence): int
    {
        self::checkName($name);
        $r = $this->call('locks/Downgrade', ['session_id' => (string) $sessionId, 'seq' => (string) $seq, 'name' => $name, 'fence' => (string) $fence]);

        return (int) ($r['fence'] ?? 0);
    }

    /**
     * Withdraws the request $seq of $sessionId on $name, whatever became of
     * it (the Cancel RPC): a waiting one leaves the queue, and a grant it
     * got and still holds is released. Idempotent.
     */
    public function cancel(int $sessionId, int $seq, string $name): void
    {
        self::checkName($name);
        $this->call('locks/Cancel', ['session_id' => (string) $sessionId, 'seq' => (string) $seq, 'name' => $name]);
    }

    private function cancelQuietly(int $sessionId, int $seq, string $name): void
    {
        try {
            $this->cancel($sessionId, $seq, $name);
        } catch (\Throwable $e) {
            // The session's end withdraws it then.
        }
    }

    private function unlockQuietly(int $sessionId): void
    {
        try {
            $this->unlock($sessionId);
        } catch (\Throwable $e) {
            // Its ttl ends it then.
        }
    }

    /**
     * Releases everything a session holds and closes it, in one write.
     * Idempotent; a session that already ended answers 0.
     *
     * @return int grants released
     */
    public function unlock(int $sessionId): int
    {
        // Belief ends at the release's send.
        $this->stream->remove($sessionId);
        try {
            $r = $this->call('locks/Unlock', ['session_id' => (string) $sessionId]);
        } catch (RaftlockException $e) {
            if ('NOT_FOUND' === $e->getStatus()) {
                return 0;
            }
            throw $e;
        }

        return (int) ($r['released'] ?? 0);
    }

    /**
     * Restarts a session's lease (no write). False if the session has
     * ended: expired, closed or unknown (final). A session this process
     * counts with a grace is renewed on the process's stream (and the
     * answer waited for); any other with a request of its own.
     */
    public function keepAlive(int $sessionId): bool
    {
        $this->stream->touch($sessionId);
        if ($this->stream->tracks($sessionId) && 'lost' === $this->stream->state($sessionId)) {
            return false;
        }
        if ($this->carried($sessionId)) {
            return $this->stream->renewNow($sessionId, SessionStream::now() + $this->retryTimeout);
        }
        $ask = ++$this->askId;
        $r = $this->call('locks/KeepAlive', ['session_id' => (string) $sessionId, 'ask_id' => (string) $ask]);
        if ((int) ($r['ask_id'] ?? 0) !== $ask) {
            throw new RaftlockException('INTERNAL', "a KeepAlive of ask $ask was answered for ask ".($r['ask_id'] ?? 0));
        }
        if ($r['expired'] ?? false) {
            $this->stream->lose($sessionId, 'the node answered that its session ended');

            return false;
        }
        $this->stream->credit($sessionId, $this->sent);

        return true;
    }

    /** Whether $sessionId is counted here with a grace, so renewed on the stream. */
    private function carried(int $sessionId): bool
    {
        return $this->stream->tracks($sessionId) && $this->stream->grace($sessionId) > 0;
    }

    /**
     * The session's state as this process counts it, sending nothing (as
     * heldFor() and track() send nothing): "held" (a renewal was sent
     * less than the lease length ago, less the 10 % margin, and answered;
     * the lease length is the grace, or the ttl if shorter or if the grace
     * is off: act on the lock), "jeopardy" (no renewal answered that
     * leaves it held, and no node said the session
     * ended: do not act on the lock; the next call that renews brings it
     * back to held if the leader answers renewed), "lost" (a node said the
     * session ended, or no renewal was answered within the ttl, less its
     * margin, from the receipt of the last answer that started a lease:
     * final), or "unknown" (not counted by this process: released, or
     * never opened or tracked here).
     */
    public function state(int $sessionId): string
    {
        return $this->stream->state($sessionId);
    }

    /**
     * For a session with a grace: renews it now on the stream, again until
     * an answer leaves it held, and answers whether it is held: true means
     * act on the lock for up to the lease length less the margin from the
     * send of the renewal answered. False when it is lost, or still in
     * jeopardy after the retry timeout (or at the end of the ttl count, if
     * sooner). For a session without a grace (its lease is its ttl):
     * answers the count, sending nothing, except for a session tracked
     * here (track()) and never renewed in this process yet, which it
     * renews once first (a KeepAlive request).
     */
    public function isHeld(int $sessionId): bool
    {
        if (!$this->stream->tracks($sessionId)) {
            return false;
        }
        if (!$this->carried($sessionId)) {
            if (!$this->stream->credited($sessionId)) {
                try {
                    $this->keepAlive($sessionId);
                } catch (RaftlockException $e) {
                    if ('UNAVAILABLE' !== $e->getStatus()) {
                        throw $e;
                    }
                }
            }

            return 'held' === $this->stream->state($sessionId);
        }
        $this->stream->touch($sessionId);
        $deadline = min(SessionStream::now() + $this->retryTimeout, $this->stream->aliveUntil($sessionId));
        try {
            do {
                if (!$this->keepAlive($sessionId)) {
                    return false;
                }
            } while ('jeopardy' === $this->stream->state($sessionId) && SessionStream::now() < $deadline);
        } catch (RaftlockException $e) {
            if ('UNAVAILABLE' !== $e->getStatus()) {
                throw $e;
            }
        }

        return 'held' === $this->stream->state($sessionId);
    }

    /**
     * Seconds the session is still held as this process counts it (0 when
     * it is not held). Sends nothing.
     */
    public function heldFor(int $sessionId): float
    {
        return max(0.0, $this->stream->heldFor($sessionId));
    }

    /**
     * Counts and renews a session this process did not open (a Symfony Key
     * handed over from another process): opened with $ttlMs and
     * $endOnDisconnectMs (the grace it asked for; 0: none). Not held until
     * a renewal is answered (isHeld(), keepAlive()). A session already
     * counted here is left as it is.
     */
    public function track(int $sessionId, int $ttlMs, int $endOnDisconnectMs): void
    {
        if (!$this->stream->tracks($sessionId)) {
            $this->stream->add($sessionId, $ttlMs, $endOnDisconnectMs, null, $this->leader);
        }
    }

    /**
     * Changes a session's ttl and restarts its lease at the new length (one
     * write, exactly once per $seq). Throws NOT_FOUND if the session ended.
     *
     * @return int the ttl now in force, in milliseconds
     */
    public function setSessionTtl(int $sessionId, int $seq, int $ttlMs): int
    {
        self::checkTtl($ttlMs);
        $this->stream->touch($sessionId);
        $this->stream->ttlChangeSent($sessionId, SessionStream::now(), $ttlMs);
        try {
            $r = $this->call('locks/SetSessionTtl', ['session_id' => (string) $sessionId, 'seq' => (string) $seq, 'ttl_ms' => (string) $ttlMs]);
        } catch (RaftlockException $e) {
            if ('NOT_FOUND' === $e->getStatus()) {
                $this->stream->lose($sessionId, 'the node answered that its session ended');
            }
            throw $e;
        }
        $this->stream->ttlChanged($sessionId, $this->sent, (int) ($r['ttl_ms'] ?? 0) ?: $ttlMs);
        $this->stream->touch($sessionId);

        return (int) ($r['ttl_ms'] ?? 0);
    }

    /**
     * Whether $fence belongs to a current holder of $name (a linearizable
     * read at the leader).
     */
    public function checkFence(string $name, int $fence): bool
    {
        self::checkName($name);
        $r = $this->call('locks/CheckFence', ['name' => $name, 'fence' => (string) $fence]);

        return (bool) ($r['current'] ?? false);
    }

    /**
     * The holders and waiters of $name, as the node's DescribeResponse
     * (proto3 JSON: 64-bit integers are strings, absent fields are empty).
     *
     * @return array<string, mixed>
     */
    public function describe(string $name): array
    {
        self::checkName($name);

        return $this->call('locks/Describe', ['name' => $name]);
    }

    public static function checkName(string $name): void
    {
        $n = \strlen($name);
        if (0 === $n || $n > self::MAX_NAME_BYTES || false === preg_match('//u', $name)) {
            throw new \InvalidArgumentException("raftlock: a lock name of $n bytes: must be 1..=".self::MAX_NAME_BYTES.' bytes of UTF-8');
        }
    }

    public static function checkTtl(int $ttlMs): void
    {
        if ($ttlMs < self::MIN_TTL_MS || $ttlMs > self::MAX_TTL_MS) {
            throw new \InvalidArgumentException("raftlock: a ttl of $ttlMs ms: sessions last ".self::MIN_TTL_MS.'..='.self::MAX_TTL_MS.' ms');
        }
    }

    /**
     * Sends $rpc ("locks/Lock", "cluster/Status", ...) to the leader and
     * returns its answer, decoded.
     *
     * @param array<string, mixed> $body
     * @param float $attemptTimeout seconds one attempt may take (0: no limit,
     *                              for a request that waits in a queue)
     *
     * @return array<string, mixed>
     */
    public function call(string $rpc, array $body, float $attemptTimeout = self::ATTEMPT_TIMEOUT): array
    {
        $json = json_encode((object) $body, \JSON_THROW_ON_ERROR | \JSON_UNESCAPED_SLASHES | \JSON_UNESCAPED_UNICODE);
        $target = $this->leader ?? $this->nextEndpoint(null);
        $budgetStart = microtime(true);
        $failures = [];
        $failed = 0;
        $hints = 0;
        $backoff = self::INITIAL_BACKOFF;
        // Attempts in a row, per endpoint, that cannot have sent the request.
        $hopeless = [];
        // Endpoints that answered that they do not serve this call.
        $unserved = [];
        while (true) {
            $started = microtime(true);
            [$status, $headers, $answer, $error, $unsent] = $this->post($target, $rpc, $json, $attemptTimeout);
            if ($unsent) {
                $hopeless[$target] = ($hopeless[$target] ?? 0) + 1;
            } else {
                $hopeless = [];
            }
            if (microtime(true) - $started > $this->retryTimeout) {
                // A request that waited long: the count starts again.
                $budgetStart = microtime(true);
            }
            if (null !== $error) {
                $failures[$target] = $error;
                if (self::hopelessEverywhere($this->endpoints, $hopeless)) {
                    throw new RaftlockException('UNAVAILABLE', 'no node accepts connections (each refused or did not resolve every attempt): '.self::tried($failures), 0, null, true);
                }
                $target = $this->forget($target);
                ++$failed;
                $hints = 0;
            } elseif (200 === $status) {
                // A follower forwards to the leader and names it in the
                // answer: go there directly from now on.
                $hint = $headers['raftlock-leader'] ?? '';
                $this->leader = '' !== $hint ? self::schemeOf($target).'://'.$hint : $target;
                $decoded = json_decode($answer, true);
                if (!\is_array($decoded)) {
                    throw new RaftlockException('INTERNAL', "$rpc answered something that is not a JSON object: $answer", $status);
                }

                return $decoded;
            } elseif (503 === $status) {
                $e = self::errorOf($status, $answer);
                $hint = $headers['raftlock-leader'] ?? ($e[2] ?? '');
                $failures[$target] = $e[0].': '.$e[1];
                if ('' !== $hint && isset($headers['raftlock-not-leader']) && $hints <= \count($this->endpoints)) {
                    // The answer names the leader: go there at once.
                    $target = self::schemeOf($target).'://'.$hint;
                    $this->leader = $target;
                    ++$hints;
                    continue;
                }
                $target = $this->forget($target);
                ++$failed;
                $hints = 0;
            } elseif (self::notServed($status, $answer)) {
                // Not a raftlock node, or one without this call: another
                // service on a dead node's port, an older raftlock during
                // an upgrade. Nothing was done there: ask the others at
                // once; once every endpoint has answered so, that is the
                // answer.
                $failures[$target] = 'does not serve this call: '.self::errorOf($status, $answer)[1];
                $unserved[$target] = true;
                if ([] === array_diff($this->endpoints, array_keys($unserved))) {
                    throw new RaftlockException('UNIMPLEMENTED', "no endpoint serves $rpc: ".self::tried($failures), $status);
                }
                $target = $this->forget($target);
                $hints = 0;
                continue;
            } elseif (504 === $status || 499 === $status) {
                // DEADLINE_EXCEEDED / CANCELLED: the outcome is unknown; the
                // same request learns it.
                $e = self::errorOf($status, $answer);
                $failures[$target] = $e[0].': '.$e[1];
                ++$failed;
                $hints = 0;
            } else {
                $e = self::errorOf($status, $answer);
                throw new RaftlockException($e[0], $e[1], $status);
            }
            if (microtime(true) - $budgetStart > $this->retryTimeout) {
                throw new RaftlockException('UNAVAILABLE', sprintf('no leader answered %s within %.1f s (%s)', $rpc, $this->retryTimeout, self::tried($failures)));
            }
            if ($failed >= \count($this->endpoints)) {
                $failed = 0;
                $pause = $backoff * (0.5 + mt_rand() / mt_getrandmax());
                $pause = min($pause, max(0.0, $this->retryTimeout - (microtime(true) - $budgetStart)));
                usleep((int) ($pause * 1e6));
                $backoff = min(self::MAX_BACKOFF, $backoff * 2);
            }
        }
    }

    /**
     * Each node tried and its last error, in the order first tried.
     *
     * @param array<string, string> $failures
     */
    private static function tried(array $failures): string
    {
        $parts = [];
        foreach ($failures as $node => $what) {
            $parts[] = "$node: $what";
        }

        return implode('; ', $parts);
    }

    /**
     * Whether every endpoint failed REFUSED_ROUNDS times in a row in a way
     * that sent nothing.
     *
     * @param list<string>       $endpoints
     * @param array<string, int> $hopeless
     */
    private static function hopelessEverywhere(array $endpoints, array $hopeless): bool
    {
        foreach ($endpoints as $e) {
            if (($hopeless[$e] ?? 0) < self::REFUSED_ROUNDS) {
                return false;
            }
        }

        return true;
    }

    /**
     * One HTTP exchange with one node.
     *
     * @return array{0: int, 1: array<string, string>, 2: string, 3: string|null, 4: bool} status, headers, body,
     *         transport error, and whether that error means nothing was sent (refused, or the name did not resolve)
     */
    private function post(string $base, string $rpc, string $json, float $timeout): array
    {
        if (null === $this->curl) {
            $this->curl = curl_init();
        }
        $h = $this->curl;
        curl_reset($h);
        $headers = [];
        $requestHeaders = ['Content-Type: application/json', 'Expect:'];
        if (null !== $this->token) {
            $requestHeaders[] = 'Authorization: Bearer '.$this->token;
        }
        curl_setopt_array($h, [
            \CURLOPT_URL => $base.'/v1/'.$rpc,
            \CURLOPT_POST => true,
            \CURLOPT_POSTFIELDS => $json,
            \CURLOPT_HTTPHEADER => $requestHeaders,
            \CURLOPT_RETURNTRANSFER => true,
            \CURLOPT_HTTP_VERSION => \CURL_HTTP_VERSION_1_1,
            \CURLOPT_CONNECTTIMEOUT_MS => (int) ($this->connectTimeout * 1000),
            \CURLOPT_TIMEOUT_MS => (int) ($timeout * 1000),
            \CURLOPT_NOSIGNAL => true,
            \CURLOPT_PROXY => '',
            // A long wait sends nothing: let the kernel notice a dead peer.
            \CURLOPT_TCP_KEEPALIVE => 1,
            \CURLOPT_TCP_KEEPIDLE => 10,
            \CURLOPT_TCP_KEEPINTVL => 5,
            \CURLOPT_HEADERFUNCTION => static function ($ch, string $line) use (&$headers): int {
                $parts = explode(':', $line, 2);
                if (2 === \count($parts)) {
                    $headers[strtolower(trim($parts[0]))] = trim($parts[1]);
                }

                return \strlen($line);
            },
        ] + $this->curlOptions);
        // In the process's multi handle, so that the stream renews this
        // process's sessions while the request runs.
        $this->sent = SessionStream::now();
        $code = SessionStream::run($h);
        if (\CURLE_OK !== $code) {
            $why = curl_error($h) ?: (curl_strerror($code) ?? "curl error $code");
            // Nothing can have been sent: say so, in the words of every
            // raftlock client.
            if (\CURLE_COULDNT_CONNECT === $code) {
                return [0, [], '', 'connection refused', true];
            }
            if (\CURLE_COULDNT_RESOLVE_HOST === $code) {
                return [0, [], '', "the name does not resolve ($why)", true];
            }

            return [0, [], '', $why, false];
        }

        return [(int) curl_getinfo($h, \CURLINFO_RESPONSE_CODE), $headers, (string) curl_multi_getcontent($h), null, false];
    }

    /**
     * Whether an answer says that its endpoint does not serve the call at
     * all: a 404 or 501 that is not a raftlock error (another service),
     * raftlock's own 404 for a route it does not have ("no route ..."), or
     * UNIMPLEMENTED. A raftlock NOT_FOUND about a session or lock is an
     * answer, not this.
     */
    private static function notServed(int $status, string $answer): bool
    {
        if (404 !== $status && 501 !== $status) {
            return false;
        }
        $b = json_decode($answer, true);
        if (!\is_array($b) || !isset($b['code'])) {
            return true;
        }

        return 'UNIMPLEMENTED' === $b['code'] || ('NOT_FOUND' === $b['code'] && str_starts_with((string) ($b['message'] ?? ''), 'no route '));
    }

    /**
     * @return array{0: string, 1: string, 2: string} code, message, leader
     */
    private static function errorOf(int $status, string $answer): array
    {
        $b = json_decode($answer, true);
        if (!\is_array($b) || !isset($b['code'])) {
            return ['UNKNOWN', "HTTP $status: $answer", ''];
        }

        return [(string) $b['code'], (string) ($b['message'] ?? ''), (string) ($b['leader'] ?? '')];
    }

    private static function schemeOf(string $base): string
    {
        return substr($base, 0, (int) strpos($base, '://'));
    }

    private function nextEndpoint(?string $not): string
    {
        $n = \count($this->endpoints);
        $next = $this->endpoints[$this->next++ % $n];
        if ($next === $not && $n > 1) {
            $next = $this->endpoints[$this->next++ % $n];
        }

        return $next;
    }

    /** Drops $base as the leader, if it was; the node to try next. */
    private function forget(string $base): string
    {
        if ($this->leader === $base) {
            $this->leader = null;
        }

        return $this->nextEndpoint($base);
    }
}
