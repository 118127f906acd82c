<?php

// The PHP runner of client/scenarios.json, read as client/scenarios.md
// says: every scenario, in order, against three `raftlockd run` processes,
// each step's outcome compared with the file's; the first that differs
// fails, naming the scenario, the step and what it got. It knows
// operations and outcomes, not scenarios: a new scenario in the file runs
// here as it is, and an operation, an outcome or a field it does not know
// fails. run.php's test_scenarios runs it.
//
// The PHP client, step by step:
// * An actor is one Raftlock\Client (the cluster's endpoints, or the
//   actor's own); each lock is a session of its own, whose ttl is the
//   actor's ttl_ms or else RaftlockStore's initial ttl, the one default
//   ttl the package documents (Client::lock takes one, with no default).
// * lock: Client::lock in this process. Without timeout_ms it waits with
//   no timeout (null), under a safety bound: past it, a curl progress
//   callback ends every transfer of the call, which then fails within the
//   client's retry timeout, and the step fails.
// * start_lock: the same call in a child process (worker.php
//   scenario-lock), which prints its outcome and, once granted, holds the
//   lock, renewing it, until it is told to release it; finish reads the
//   outcome; cancel kills the child (SIGKILL: its connection closes and
//   the node withdraws the wait); "cancelled" is a child this runner
//   ended before it printed a grant.
// * release: Client::unlock of the grant's session (by the child that
//   holds it, for a started lock). check_fence: Client::checkFence.
//   check_held: a renewal (Client::keepAlive) answering true.
// * PHP renews nothing in the background. This runner renews the grants
//   it holds every third of their ttl (the lease rule's interval), between
//   steps and while it polls, as a PHP program that holds a lock renews
//   between its pieces of work; the lost-lock notice of expect_lost is a
//   renewal answering false.
// * revoke: Client::call of cluster/RevokeSession; describe: Client::describe;
//   kill_leader: SIGKILL of the node that says it leads (NodeProcesses).

declare(strict_types=1);

namespace Raftlock\Tests;

use Raftlock\Client;
use Raftlock\RaftlockException;
use Raftlock\Symfony\RaftlockStore;

/** A step whose outcome differs from the file's, or that this runner cannot read. */
final class StepMismatch extends \RuntimeException
{
}

/** Sleeps until $t (microtime), if it is in the future. */
function sleepUntil(float $t): void
{
    $left = $t - microtime(true);
    if ($left > 0) {
        usleep((int) ($left * 1e6));
    }
}

/**
 * The safety bound of a lock without a timeout in this process: once
 * $until has passed, its curl progress callback ends the transfer.
 */
final class WaitGuard
{
    public float $until = \INF;
    public bool $fired = false;

    /** @return array<int, mixed> the CURLOPT_* settings, for Client's `curl` option */
    public function curlOptions(): array
    {
        return [
            \CURLOPT_NOPROGRESS => false,
            \CURLOPT_XFERINFOFUNCTION => function ($ch, int $downTotal, int $down, int $upTotal, int $up): int {
                if (microtime(true) < $this->until) {
                    return 0;
                }
                $this->fired = true;

                return 1;
            },
        ];
    }
}

/**
 * A lock taken in a child process (worker.php scenario-lock). Messages
 * are JSON lines: its outcome, then answers to "keepalive" and "release",
 * and "lost" when one of its renewals answered false.
 */
final class LockChild
{
    /** @var resource */
    private $proc;
    /** @var array<int, resource> */
    private array $pipes = [];
    /** @var array<string, mixed>|null the outcome line, once read */
    public ?array $outcome = null;
    public bool $killed = false;
    public bool $lost = false;
    private bool $ended = false;

    /** @param array<string, mixed> $spec the lock call's arguments */
    public function __construct(string $endpoints, array $spec)
    {
        $args = [\PHP_BINARY, __DIR__.'/worker.php', 'scenario-lock', $endpoints, json_encode($spec, \JSON_THROW_ON_ERROR)];
        $this->proc = proc_open($args, [0 => ['pipe', 'r'], 1 => ['pipe', 'w'], 2 => \STDERR], $this->pipes);
    }

    /**
     * The child's next message by $deadline; null if none came by then or
     * it ended. A lost-lock notice is noted on the way.
     *
     * @return array<string, mixed>|null
     */
    private function next(float $deadline): ?array
    {
        while (!$this->ended) {
            $left = max(0.0, $deadline - microtime(true));
            $r = [$this->pipes[1]];
            $w = $e = null;
            if (0 === stream_select($r, $w, $e, (int) $left, (int) (fmod($left, 1.0) * 1e6))) {
                if (microtime(true) >= $deadline) {
                    return null;
                }
                continue;
            }
            $line = fgets($this->pipes[1]);
            if (false === $line) {
                $this->ended = true;

                return null;
            }
            $m = json_decode($line, true);
            if (!\is_array($m) || !isset($m['event'])) {
                throw new StepMismatch('the child printed "'.rtrim($line).'"');
            }
            if ('lost' === $m['event']) {
                $this->lost = true;
            } elseif ('outcome' === $m['event']) {
                $this->outcome = $m;
            }

            return $m;
        }

        return null;
    }

    /**
     * The lock's outcome by $deadline: the child's outcome line; "cancelled"
     * if this runner ended the child before it printed one; null if it
     * still waits.
     *
     * @return array<string, mixed>|null
     */
    public function outcome(float $deadline): ?array
    {
        // A killed child printed all it ever will: read to its end.
        $until = $this->killed ? microtime(true) + 10 : $deadline;
        while (null === $this->outcome && null !== $this->next($until)) {
        }
        if (null !== $this->outcome) {
            return $this->outcome;
        }
        if ($this->killed) {
            return ['outcome' => 'cancelled'];
        }
        if ($this->ended) {
            return ['outcome' => 'error', 'error' => ['class' => '', 'status' => '', 'message' => 'the child process ended without an outcome', 'unreachable' => false]];
        }

        return null;
    }

    /**
     * Sends $command and returns the answer whose event is $event.
     *
     * @return array<string, mixed>
     */
    public function ask(string $command, string $event, float $within = 30): array
    {
        fwrite($this->pipes[0], $command."\n");
        fflush($this->pipes[0]);
        $deadline = microtime(true) + $within;
        while (null !== ($m = $this->next($deadline))) {
            if ($event === $m['event']) {
                return $m;
            }
            if ('error' === $m['event']) {
                throw new StepMismatch("the child's $command failed: ".describeError($m['error']));
            }
        }
        throw new StepMismatch("the child answered no $command within $within s".($this->ended ? ' (it ended)' : ''));
    }

    /** Waits until a renewal of the child's answered false, by $deadline. */
    public function lostBy(float $deadline): bool
    {
        while (!$this->lost && null !== $this->next($deadline)) {
        }

        return $this->lost;
    }

    /** Gives the wait up as a PHP caller does: the process ends (SIGKILL). */
    public function kill(): void
    {
        $this->killed = true;
        proc_terminate($this->proc, 9);
        eventually(10, 'the killed child to end', fn () => !proc_get_status($this->proc)['running']);
    }

    public function close(): void
    {
        if (!\is_resource($this->proc)) {
            return;
        }
        if (proc_get_status($this->proc)['running']) {
            proc_terminate($this->proc, 9);
        }
        foreach ($this->pipes as $p) {
            if (\is_resource($p)) {
                fclose($p);
            }
        }
        proc_close($this->proc);
    }
}

/** A granted lock, held by this process (through $client) or by a child. */
final class Grant
{
    public bool $released = false;
    public bool $lost = false;
    public float $renewAt;
    public ?string $renewError = null;

    public function __construct(
        public string $name,
        public int $fence,
        public int $sessionId,
        public int $ttlMs,
        public ?Client $client,
        public ?LockChild $child,
        float $sent,
    ) {
        $this->renewAt = $sent + $ttlMs / 3000;
    }

    /** A renewal now: whether the client still holds it. */
    public function renew(): bool
    {
        if (null !== $this->child) {
            $held = (bool) $this->child->ask('keepalive', 'held')['held'];
            $this->lost = $this->child->lost || !$held;

            return $held;
        }
        if (!$this->lost) {
            $this->renewAt = microtime(true) + $this->ttlMs / 3000;
            $this->lost = !$this->client->keepAlive($this->sessionId);
        }

        return !$this->lost;
    }

    /** Renews a grant this process holds once a third of its ttl has passed since the last renewal was sent. */
    public function renewIfDue(): void
    {
        if (null === $this->client || $this->released || $this->lost || microtime(true) < $this->renewAt) {
            return;
        }
        try {
            $this->renew();
            $this->renewError = null;
        } catch (\Throwable $e) {
            // The next renewal tries again.
            $this->renewError = $e->getMessage();
        }
    }

    /** Whether the lost-lock notice comes by $deadline: a renewal, every third of the ttl, answering false. */
    public function lostBy(float $deadline): bool
    {
        if (null !== $this->child) {
            return $this->lost = $this->child->lostBy($deadline);
        }
        while (!$this->lost && $this->renewAt <= $deadline) {
            sleepUntil($this->renewAt);
            $this->renewIfDue();
        }

        return $this->lost;
    }

    /** @return int grants released, as the node answered */
    public function release(): int
    {
        $n = null !== $this->child ? (int) $this->child->ask('release', 'released')['released'] : $this->client->unlock($this->sessionId);
        $this->released = true;

        return $n;
    }
}

/** An error as the child reports it: class, status (a RaftlockException's) and message. */
function errorOf(\Throwable $e): array
{
    return ['class' => \get_class($e), 'status' => $e instanceof RaftlockException ? $e->getStatus() : '', 'message' => $e->getMessage(), 'unreachable' => $e instanceof RaftlockException && $e->isUnreachable()];
}

/** @param array{class: string, status: string, message: string, unreachable: bool} $e */
function describeError(array $e): string
{
    return trim($e['class'].('' !== $e['status'] ? ' '.$e['status'] : '').': '.$e['message']);
}

/**
 * The scenario outcome an error of the client is: invalid_argument (the
 * client's InvalidArgumentException before sending, or the node's
 * INVALID_ARGUMENT), unreachable (the client's UNAVAILABLE when no node
 * accepted a connection: each refused or did not resolve), or null for
 * any other error.
 *
 * @param array{class: string, status: string, message: string, unreachable: bool} $e
 */
function outcomeOfError(array $e): ?string
{
    $raftlock = is_a($e['class'], RaftlockException::class, true);
    if (is_a($e['class'], \InvalidArgumentException::class, true) || ($raftlock && 'INVALID_ARGUMENT' === $e['status'])) {
        return 'invalid_argument';
    }
    if ($raftlock && ($e['unreachable'] ?? false)) {
        return 'unreachable';
    }

    return null;
}

final class ScenarioRunner
{
    /** Longest a lock without timeout_ms waits in this process, unless its step allows longer. */
    private const SAFETY_MS = 60000;
    /** How long describe polls (scenarios.md). */
    private const DESCRIBE_WITHIN = 10.0;
    private const LOCK_OUTCOMES = ['granted', 'not_acquired', 'cancelled', 'invalid_argument', 'unreachable'];
    private const LOCK_ARGS = ['actor', 'name', 'mode', 'capacity', 'weight', 'timeout_ms'];
    private const CHECKS = ['expect', 'fence_above', 'message_contains', 'min_elapsed_ms', 'max_elapsed_ms'];
    /** Each operation's fields, besides op. */
    private const OPS = [
        'lock' => [...self::LOCK_ARGS, 'as', ...self::CHECKS],
        'start_lock' => [...self::LOCK_ARGS, 'as'],
        'finish' => ['grant', 'within_ms', ...self::CHECKS],
        'cancel' => ['grant'],
        'release' => ['grant', 'expect'],
        'describe' => ['name', 'holders', 'waiters'],
        'check_fence' => ['grant', 'expect'],
        'check_held' => ['grant', 'expect'],
        'revoke' => ['grant'],
        'expect_lost' => ['grant', 'within_ms'],
        'kill_leader' => [],
    ];

    private Client $admin;
    private int $defaultTtlMs;
    /** @var array<string, array{endpoints: string, ttl_ms: int, guard: WaitGuard, client: Client|null}> */
    private array $actors = [];
    /** @var array<string, Grant> */
    private array $grants = [];
    /** @var array<string, LockChild> started locks not finished yet */
    private array $started = [];
    /** @var array<string, array{name: string, ttl_ms: int}> their calls, for the grants they may become */
    private array $startedCalls = [];
    /** @var list<LockChild> */
    private array $children = [];

    public function __construct(private NodeProcesses $cluster)
    {
        $this->admin = new Client($cluster->endpoints());
        $initialTtl = (new \ReflectionParameter([RaftlockStore::class, '__construct'], 'initialTtl'))->getDefaultValue();
        $this->defaultTtlMs = (int) round($initialTtl * 1000);
    }

    /**
     * Runs every scenario of $file, in order; $done(name, seconds) after each.
     *
     * @return int the scenarios run
     */
    public function runFile(string $file, callable $done): int
    {
        $doc = json_decode((string) file_get_contents($file), true, 64, \JSON_THROW_ON_ERROR);
        check(\is_array($doc) && \is_array($doc['scenarios'] ?? null) && !array_diff(array_keys($doc), ['about', 'scenarios']), "$file: want an object of about and scenarios");
        foreach ($doc['scenarios'] as $i => $scenario) {
            $t = microtime(true);
            $this->scenario($i, $scenario);
            $done($scenario['name'], microtime(true) - $t);
        }

        return \count($doc['scenarios']);
    }

    private function scenario(int $index, mixed $sc): void
    {
        $what = \is_array($sc) && \is_string($sc['name'] ?? null) ? "scenario \"{$sc['name']}\"" : "scenario $index";
        if (!\is_array($sc) || !\is_string($sc['name'] ?? null) || !\is_array($sc['actors'] ?? null) || !\is_array($sc['steps'] ?? null) || !array_is_list($sc['steps'])
            || array_diff(array_keys($sc), ['name', 'actors', 'steps'])) {
            throw new TestFailure("$what: want name, actors and steps, got ".json_encode($sc));
        }
        // Each scenario starts with every node running.
        $this->cluster->restartKilled();
        $this->actors = $this->grants = $this->started = $this->startedCalls = [];
        try {
            foreach ($sc['actors'] as $name => $a) {
                if (!\is_array($a) || array_diff(array_keys($a), ['ttl_ms', 'endpoints']) || (isset($a['ttl_ms']) && !\is_int($a['ttl_ms']))
                    || (isset($a['endpoints']) && (!\is_array($a['endpoints']) || !array_is_list($a['endpoints']) || array_filter($a['endpoints'], fn ($e) => !\is_string($e))))) {
                    throw new TestFailure("$what: actor \"$name\": want ttl_ms (an integer) and endpoints (strings), got ".json_encode($a));
                }
                $this->actors[(string) $name] = [
                    'endpoints' => isset($a['endpoints']) ? implode(',', $a['endpoints']) : $this->cluster->endpoints(),
                    'ttl_ms' => $a['ttl_ms'] ?? $this->defaultTtlMs,
                    'guard' => new WaitGuard(),
                    'client' => null,
                ];
            }
            foreach ($sc['steps'] as $i => $step) {
                try {
                    $this->renewDue();
                    $this->step($step);
                } catch (\Throwable $e) {
                    $got = $e instanceof StepMismatch || $e instanceof TestFailure ? $e->getMessage() : 'got '.describeError(errorOf($e));
                    throw new TestFailure(sprintf('%s, step %d of %d %s: %s', $what, $i + 1, \count($sc['steps']), json_encode($step, \JSON_UNESCAPED_SLASHES | \JSON_UNESCAPED_UNICODE), $got), 0, $e);
                }
            }
        } finally {
            foreach ($this->children as $child) {
                $child->close();
            }
            $this->children = [];
        }
    }

    /** Renews the grants this process holds whose renewal is due. */
    private function renewDue(): void
    {
        foreach ($this->grants as $g) {
            $g->renewIfDue();
        }
    }

    private function step(mixed $step): void
    {
        if (!\is_array($step) || !\is_string($step['op'] ?? null)) {
            throw new StepMismatch('a step is an object with an op');
        }
        $op = $step['op'];
        if (!isset(self::OPS[$op])) {
            throw new StepMismatch("unknown op \"$op\"");
        }
        $unknown = array_diff(array_keys($step), ['op', ...self::OPS[$op]]);
        if ($unknown) {
            throw new StepMismatch("$op does not take ".implode(', ', $unknown));
        }
        if (isset($step['expect'])) {
            $known = match ($op) {
                'lock', 'finish' => self::LOCK_OUTCOMES,
                'release' => ['released'],
                default => [true, false],
            };
            if (!\in_array($step['expect'], $known, true)) {
                throw new StepMismatch('unknown expect '.json_encode($step['expect'])." for $op");
            }
        }
        match ($op) {
            'lock' => $this->lock($step),
            'start_lock' => $this->startLock($step),
            'finish' => $this->finish($step),
            'cancel' => $this->startedLock($step)->kill(),
            'release' => $this->release($step),
            'describe' => $this->describe($step),
            'check_fence' => $this->checkFence($step),
            'check_held' => $this->checkSame(self::need($step, 'expect'), $this->grant($step)->renew(), 'held (a renewal answering true)'),
            'revoke' => $this->revoke($step),
            'expect_lost' => $this->expectLost($step),
            'kill_leader' => $this->cluster->kill($this->cluster->leaderId()),
        };
    }

    private static function need(array $step, string $key): mixed
    {
        if (!\array_key_exists($key, $step)) {
            throw new StepMismatch("{$step['op']} needs $key");
        }

        return $step[$key];
    }

    private static function needInt(array $step, string $key): int
    {
        $v = self::need($step, $key);
        if (!\is_int($v) || $v < 0) {
            throw new StepMismatch("$key: want a non-negative integer, got ".json_encode($v));
        }

        return $v;
    }

    private function checkSame(mixed $want, mixed $got, string $what): void
    {
        if ($want !== $got) {
            throw new StepMismatch("$what: want ".json_encode($want).', got '.json_encode($got));
        }
    }

    private function grant(array $step): Grant
    {
        $g = self::need($step, 'grant');

        return $this->grants[$g] ?? throw new StepMismatch('no grant named '.json_encode($g));
    }

    private function startedLock(array $step): LockChild
    {
        $g = self::need($step, 'grant');

        return $this->started[$g] ?? throw new StepMismatch('no started lock named '.json_encode($g).' waits for its outcome');
    }

    /** A name of a step: a string, or {"repeat": S, "times": N}. */
    private static function name(mixed $name): string
    {
        if (\is_string($name)) {
            return $name;
        }
        if (\is_array($name) && ['repeat', 'times'] === array_keys($name) && \is_string($name['repeat']) && \is_int($name['times']) && $name['times'] >= 0) {
            return str_repeat($name['repeat'], $name['times']);
        }
        throw new StepMismatch('a name is a string or {"repeat": S, "times": N}, got '.json_encode($name));
    }

    /**
     * The actor and the arguments of Client::lock a lock step gives.
     *
     * @return array{0: array{endpoints: string, ttl_ms: int, guard: WaitGuard, client: Client|null}, 1: array{name: string, ttl_ms: int, timeout_ms: int|null, mode: string, weight: int, capacity: int}}
     */
    private function lockCall(array $step): array
    {
        $actor = self::need($step, 'actor');
        if (!isset($this->actors[$actor])) {
            throw new StepMismatch('no actor named '.json_encode($actor));
        }
        $semaphore = isset($step['capacity']) || isset($step['weight']);
        $mode = match ($step['mode'] ?? null) {
            null => $semaphore ? Client::SEMAPHORE : Client::EXCLUSIVE,
            'exclusive' => Client::EXCLUSIVE,
            'shared' => Client::SHARED,
            default => throw new StepMismatch('unknown mode '.json_encode($step['mode'])),
        };
        if ($semaphore && Client::SEMAPHORE !== $mode) {
            throw new StepMismatch('capacity and weight are for a semaphore, which has no mode');
        }

        return [$this->actors[$actor], [
            'name' => self::name(self::need($step, 'name')),
            'ttl_ms' => $this->actors[$actor]['ttl_ms'],
            'timeout_ms' => isset($step['timeout_ms']) ? self::needInt($step, 'timeout_ms') : null,
            'mode' => $mode,
            'weight' => isset($step['weight']) ? self::needInt($step, 'weight') : 0,
            'capacity' => isset($step['capacity']) ? self::needInt($step, 'capacity') : 0,
        ]];
    }

    private function lock(array $step): void
    {
        [$actor, $call] = $this->lockCall($step);
        $guard = $actor['guard'];
        $guard->fired = false;
        $bound = max(self::SAFETY_MS, $step['max_elapsed_ms'] ?? 0);
        if (null === $call['timeout_ms']) {
            $guard->until = microtime(true) + $bound / 1000;
        }
        $sent = microtime(true);
        try {
            // The actor's client, made at its first lock: a malformed
            // endpoint is the client's refusal of bad input.
            $client = $this->actors[$step['actor']]['client'] ??= new Client($actor['endpoints'], null, ['curl' => $guard->curlOptions()]);
            $r = $client->lock($call['name'], $call['ttl_ms'], $call['timeout_ms'], $call['mode'], $call['weight'], $call['capacity']);
            $o = $r['acquired']
                ? ['outcome' => 'granted', 'fence' => $r['fence'], 'session_id' => $r['session_id'], 'ttl_ms' => $r['ttl_ms']]
                : ['outcome' => 'not_acquired'];
        } catch (\Throwable $e) {
            $o = ['outcome' => 'error', 'error' => errorOf($e)];
        } finally {
            $guard->until = \INF;
        }
        $o['elapsed_ms'] = (int) round((microtime(true) - $sent) * 1000);
        if ($guard->fired) {
            throw new StepMismatch("no outcome within the safety bound of $bound ms: the wait was ended, and then ".self::describeOutcome($o));
        }
        $this->checkOutcome($step, $o);
        if ('granted' === $o['outcome'] && isset($step['as'])) {
            $this->addGrant($step['as'], new Grant($call['name'], $o['fence'], $o['session_id'], $o['ttl_ms'] ?: $call['ttl_ms'], $client, null, $sent));
        }
    }

    private function startLock(array $step): void
    {
        [$actor, $call] = $this->lockCall($step);
        $as = self::need($step, 'as');
        if (isset($this->grants[$as]) || isset($this->started[$as])) {
            throw new StepMismatch("\"$as\" names another grant already");
        }
        $child = new LockChild($actor['endpoints'], $call);
        $this->children[] = $child;
        $this->started[$as] = $child;
        $this->startedCalls[$as] = $call;
    }

    private function finish(array $step): void
    {
        $child = $this->startedLock($step);
        $as = $step['grant'];
        $within = self::needInt($step, 'within_ms');
        $deadline = microtime(true) + $within / 1000;
        $o = null;
        while (null === $o && microtime(true) < $deadline) {
            // Renew this process's grants while the child waits.
            $this->renewDue();
            $o = $child->outcome(min($deadline, microtime(true) + 0.5));
        }
        if (null === $o) {
            throw new StepMismatch("no outcome within $within ms (the child still waits)");
        }
        $call = $this->startedCalls[$as];
        unset($this->started[$as], $this->startedCalls[$as]);
        $this->checkOutcome($step, $o);
        if ('granted' === $o['outcome']) {
            $this->addGrant($as, new Grant($call['name'], $o['fence'], $o['session_id'], $o['ttl_ms'] ?: $call['ttl_ms'], null, $child, microtime(true)));
        }
    }

    private function addGrant(string $as, Grant $g): void
    {
        if (isset($this->grants[$as])) {
            throw new StepMismatch("\"$as\" names another grant already");
        }
        $this->grants[$as] = $g;
    }

    /** @param array<string, mixed> $o */
    private static function describeOutcome(array $o): string
    {
        $took = isset($o['elapsed_ms']) ? " in {$o['elapsed_ms']} ms" : '';

        return match ($o['outcome']) {
            'granted' => "granted (fence {$o['fence']}, session {$o['session_id']})$took",
            'error' => (outcomeOfError($o['error']) ?? 'an error that is no outcome of the file').' ('.describeError($o['error']).")$took",
            default => $o['outcome'].$took,
        };
    }

    /** Compares an outcome with the step's expect and its checks. */
    private function checkOutcome(array $step, array $o): void
    {
        $want = self::need($step, 'expect');
        $got = 'error' === $o['outcome'] ? outcomeOfError($o['error']) : $o['outcome'];
        if ($got !== $want) {
            throw new StepMismatch("want $want, got ".self::describeOutcome($o));
        }
        if (isset($step['message_contains']) && !str_contains($o['error']['message'] ?? '', $step['message_contains'])) {
            throw new StepMismatch("want a message containing \"{$step['message_contains']}\", got ".self::describeOutcome($o));
        }
        $took = $o['elapsed_ms'] ?? null;
        if (isset($step['min_elapsed_ms']) && (null === $took || $took < self::needInt($step, 'min_elapsed_ms'))) {
            throw new StepMismatch("want at least {$step['min_elapsed_ms']} ms, got ".self::describeOutcome($o));
        }
        if (isset($step['max_elapsed_ms']) && (null === $took || $took > self::needInt($step, 'max_elapsed_ms'))) {
            throw new StepMismatch("want at most {$step['max_elapsed_ms']} ms, got ".self::describeOutcome($o));
        }
        if (isset($step['fence_above'])) {
            $below = $this->grants[$step['fence_above']] ?? throw new StepMismatch('fence_above: no grant named '.json_encode($step['fence_above']));
            if ($o['fence'] <= $below->fence) {
                throw new StepMismatch("want a fence above {$step['fence_above']}'s {$below->fence}, got ".self::describeOutcome($o));
            }
        }
    }

    private function release(array $step): void
    {
        $g = $this->grant($step);
        self::need($step, 'expect');
        if ($g->released) {
            throw new StepMismatch("{$step['grant']} was released already");
        }
        try {
            $g->release();
        } catch (StepMismatch $e) {
            throw $e;
        } catch (\Throwable $e) {
            throw new StepMismatch('want released, got '.describeError(errorOf($e)), 0, $e);
        }
    }

    private function describe(array $step): void
    {
        $name = self::name(self::need($step, 'name'));
        $want = [self::needInt($step, 'holders'), self::needInt($step, 'waiters')];
        $deadline = microtime(true) + self::DESCRIBE_WITHIN;
        while (true) {
            $info = $this->admin->describe($name)['info'] ?? [];
            $got = [\count($info['holders'] ?? []), \count($info['waiters'] ?? [])];
            if ($got === $want) {
                return;
            }
            if (microtime(true) > $deadline) {
                throw new StepMismatch(sprintf('want %d holders and %d waiters within %.0f s, got %d and %d: %s', $want[0], $want[1], self::DESCRIBE_WITHIN, $got[0], $got[1], json_encode($info)));
            }
            $this->renewDue();
            usleep(20000); // polling interval, under the deadline
        }
    }

    private function checkFence(array $step): void
    {
        $g = $this->grant($step);
        $this->checkSame(self::need($step, 'expect'), $this->admin->checkFence($g->name, $g->fence), "CheckFence of {$step['grant']}'s fence {$g->fence}");
    }

    private function revoke(array $step): void
    {
        $g = $this->grant($step);
        // The node answers once the session has ended: when the lease its
        // last renewal earned runs out, up to a ttl from now.
        $this->admin->call('cluster/RevokeSession', ['session_id' => (string) $g->sessionId], $g->ttlMs / 1000 + Client::ATTEMPT_TIMEOUT);
    }

    private function expectLost(array $step): void
    {
        $g = $this->grant($step);
        $within = self::needInt($step, 'within_ms');
        if (!$g->lostBy(microtime(true) + $within / 1000)) {
            $every = (int) round($g->ttlMs / 3);
            throw new StepMismatch("no lost-lock notice within $within ms: renewals every $every ms answered held".(null !== $g->renewError ? " (the last one failed: {$g->renewError})" : ''));
        }
    }
}
