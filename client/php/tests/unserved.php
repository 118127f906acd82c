<?php

// A web server that does not serve raftlock's calls, for the PHP suite's
// pass-over tests (`php -S 127.0.0.1:PORT unserved.php`): every request
// but GET /ready is answered with status $UNSERVED_STATUS, content type
// $UNSERVED_TYPE and body $UNSERVED_BODY, and appends a line to the file
// $UNSERVED_LOG, so the test can count the requests it got.

declare(strict_types=1);

if ('/ready' === parse_url($_SERVER['REQUEST_URI'] ?? '', \PHP_URL_PATH)) {
    echo 'ready';

    return;
}
file_put_contents((string) getenv('UNSERVED_LOG'), "asked\n", \FILE_APPEND | \LOCK_EX);
http_response_code((int) getenv('UNSERVED_STATUS'));
header('Content-Type: '.getenv('UNSERVED_TYPE'));
echo getenv('UNSERVED_BODY');
