@echo off
rem rbroker coordinator launcher for Windows.
rem   rbroker-server.cmd                 serve (the default)
rem   rbroker-server.cmd setup ...       any rbroker-server command and its flags
rem The data dir is %RBROKER_SERVER_DATA_DIR%, else %ProgramData%\rbroker-server.
rem The coordinator is looked for in .\venv next to this file, else on PATH.
setlocal
if "%RBROKER_SERVER_DATA_DIR%"=="" set "RBROKER_SERVER_DATA_DIR=%ProgramData%\rbroker-server"
set "RBROKER_EXE=rbroker-server"
if exist "%~dp0venv\Scripts\rbroker-server.exe" set "RBROKER_EXE=%~dp0venv\Scripts\rbroker-server.exe"
if "%~1"=="" (
    "%RBROKER_EXE%" serve
) else (
    "%RBROKER_EXE%" %*
)
exit /b %ERRORLEVEL%
