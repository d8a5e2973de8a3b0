#!/usr/bin/env bash
# The dead-code check of `make lint` (vulture): code that nothing in the repository uses, the
# tests included. Names a framework calls by convention are ignored here; what is used only
# from templates, settings, schemas or strings is listed in lint/dead_code_allowed.py.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${VULTURE:-.venv/bin/vulture}" \
  jobs workers console trainyard_cli stack bench tests lint/dead_code_allowed.py \
  --exclude "*/migrations/*,console/formats" \
  --ignore-decorators "@api.*,@app.task,@admin.*,@*.register,@receiver,@property,@*.setter,@*.connect,@login_required,@require_*,@staff_member_required,@csrf_*,@register.*,@*.command,@pytest.fixture,@shared_task,@cli.*,@*.group" \
  --ignore-names "Meta,help,Command,urlpatterns,application,model_config,*Middleware,ready,handle,add_arguments,process_exception,receive_data_chunk,file_complete,job_event,credentials_changed,connect,disconnect,receive,aauthenticate,authenticate,parse_body,get_*,has_*_permission,clean_*,save_model,constraints,indexes,ordering,verbose_name*,list_*,search_fields,readonly_fields,fieldsets,filter_horizontal,site_*,index_title,change_*_form,change_*_template,field_order,test_*,pytest_*,pytestmark" "$@"
