<?php

// A request handler for PHP's built-in web server (tests/run.php's
// test_request_end_frees_a_forgotten_lock): one process serving request
// after request, as a PHP-FPM worker does. `?pid` answers the process id;
// `?forget=NAME` takes NAME at the client's defaults and ends the request
// without releasing it.

declare(strict_types=1);

require __DIR__.'/../autoload.php';

if (isset($_GET['pid'])) {
    echo 'pid ', getmypid();

    return;
}
$client = new Raftlock\Client((string) getenv('RAFTLOCK_ENDPOINTS'));
$r = $client->lock((string) $_GET['forget'], 30000, 0);
echo $r['acquired'] ? "held session {$r['session_id']}" : 'not acquired';
